"""Everything that touches a board: the board registry, the serial protocol (host side), the QEMU
emulator, the PlatformIO project and toolchain, host C builds and the fault-injecting proxy."""
