/* setup() and loop() of tinytrain's own Arduino projects (tinytrain/pio_project.py).
 *
 * The Arduino core owns main(); the project sources are built with -Dmain=tt_app_main
 * (PlatformIO build_src_flags). setup() runs the application's main() once: the device glue's
 * main() starts the serial link with tt_device_begin() and returns, and loop() then answers the
 * host one request per call with tt_device_poll(), so the core's own loop work (USB, yield())
 * keeps running. An application that did not start the link (the echo app) ends in
 * tt_port_exit() with its return value, as on the bare-metal ports. */
#include <Arduino.h>

#include "tt_device.h"
#include "tt_port.h"

extern "C" int tt_app_main(void);

void setup(void)
{
    int rc = tt_app_main();
    if (tt_device_poll() < 0) { /* no link started: the application is done */
        tt_port_exit(rc);
    }
}

void loop(void) { (void)tt_device_poll(); }
