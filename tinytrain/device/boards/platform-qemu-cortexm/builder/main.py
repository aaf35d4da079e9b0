"""SCons build script of the qemu-cortexm platform: bare-metal C with the system arm-none-eabi-gcc.

Flags come from the board manifest (boards/<board>.json, ``build`` section):
  cpu        -> -mcpu=..., always -mthumb
  fpu        -> -mfpu=... -mfloat-abi=<float_abi> (hard-float builds); absent -> -mfloat-abi=soft
  ldscript   -> linker script: board_build.ldscript in platformio.ini (tinytrain's projects
                carry their port, linker script included, so they build wherever they are)
Targets: default (ELF + .bin + size), ``upload`` (runs the ELF in QEMU, UART0 on stdio; Ctrl-A X quits).
"""

import os
import shutil
import sys

from SCons.Script import AlwaysBuild, Builder, Default, DefaultEnvironment

env = DefaultEnvironment()
platform = env.PioPlatform()
board = env.BoardConfig()

PREFIX = "arm-none-eabi-"
if not shutil.which(PREFIX + "gcc"):
    sys.stderr.write(
        "Error: arm-none-eabi-gcc not found on PATH. The qemu-cortexm platform uses the system "
        "toolchain: sudo apt-get install -y gcc-arm-none-eabi libnewlib-arm-none-eabi\n"
    )
    env.Exit(1)

env.Replace(
    AR=PREFIX + "gcc-ar",
    AS=PREFIX + "as",
    CC=PREFIX + "gcc",
    CXX=PREFIX + "g++",
    GDB=PREFIX + "gdb",
    OBJCOPY=PREFIX + "objcopy",
    RANLIB=PREFIX + "gcc-ranlib",
    SIZETOOL=PREFIX + "size",
    ARFLAGS=["rc"],
    SIZEPROGREGEXP=r"^(?:\.text|\.data|\.rodata|\.text.align|\.ARM.exidx|\.isr_vector)\s+(\d+).*",
    SIZEDATAREGEXP=r"^(?:\.data|\.bss|\.noinit|\.stack|\.heap)\s+(\d+).*",
    SIZECHECKCMD="$SIZETOOL -A -d $SOURCES",
    SIZEPRINTCMD="$SIZETOOL -B -d $SOURCES",
    PROGNAME="firmware",
    PROGSUFFIX=".elf",
)

cpu = board.get("build.cpu")
machine_flags = ["-mcpu=%s" % cpu, "-mthumb"]
if board.get("build.fpu", ""):
    machine_flags += ["-mfpu=%s" % board.get("build.fpu"),
                      "-mfloat-abi=%s" % board.get("build.float_abi", "hard")]
else:
    machine_flags += ["-mfloat-abi=soft"]

env.Append(
    ASFLAGS=machine_flags,
    ASPPFLAGS=["-x", "assembler-with-cpp"],
    CCFLAGS=machine_flags + ["-O2", "-g", "-ffunction-sections", "-fdata-sections"],
    CFLAGS=["-std=c99"],
    CPPDEFINES=[("F_CPU", "$BOARD_F_CPU"), ("TT_BOARD_%s" % board.id.upper(), 1)],
    LINKFLAGS=machine_flags + ["-Wl,--gc-sections", "--specs=nano.specs", "--specs=nosys.specs",
                               "-Wl,-Map,${BUILD_DIR}/firmware.map"],
    LIBS=["c", "gcc", "nosys"],
)

# Linker script: board_build.ldscript (absolute or project-relative); the board's default name is
# also searched in the project's copy of its port (src/port_<port>/).
port = board.get("build.port", "")
port_dir = os.path.join(env.subst("$PROJECT_SRC_DIR"), "port_" + port)
if port and os.path.isdir(port_dir):
    env.Append(LIBPATH=[port_dir])

env.Append(BUILDERS=dict(
    ElfToBin=Builder(action=env.VerboseAction(" ".join(["$OBJCOPY", "-O", "binary", "$SOURCES", "$TARGET"]),
                                              "Building $TARGET"), suffix=".bin"),
))

target_elf = env.BuildProgram()
target_bin = env.ElfToBin(os.path.join("$BUILD_DIR", "${PROGNAME}"), target_elf)
env.Depends(target_bin, "checkprogsize")

target_buildprog = env.Alias("buildprog", target_bin, target_bin)

target_size = env.Alias("size", target_elf, env.VerboseAction("$SIZEPRINTCMD", "Calculating size $SOURCE"))
AlwaysBuild(target_size)

# "upload" on an emulated board = run it in QEMU, UART0 on this terminal (Ctrl-A X quits QEMU).
qemu_cmd = " ".join([
    "qemu-system-arm", "-machine", board.get("build.qemu_machine"), "-nographic",
    "-icount", "shift=7", "-semihosting-config", "enable=on,target=native",
    "-serial", "mon:stdio", "-kernel", "$SOURCE",
])
upload = env.Alias("upload", target_elf, env.VerboseAction(qemu_cmd, "Running $SOURCE in QEMU"))
AlwaysBuild(upload)

Default([target_buildprog, target_size])
