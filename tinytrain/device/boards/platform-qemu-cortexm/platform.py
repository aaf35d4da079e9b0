"""PlatformIO development platform ``qemu-cortexm``: emulated Cortex-M boards, system toolchain.

PlatformIO derives the class name from the platform name: ``qemu-cortexm`` -> ``QemucortexmPlatform``.
The platform declares no packages, so ``pio run`` installs nothing; the compiler is the system
``arm-none-eabi-gcc`` found on ``$PATH`` by ``builder/main.py``.
"""

from platformio.public import PlatformBase


class QemucortexmPlatform(PlatformBase):
    def is_embedded(self):
        # No "uploader" package exists (QEMU is a system tool), but these are embedded targets:
        # report it so PlatformIO checks program size against the board's RAM/flash.
        return True
