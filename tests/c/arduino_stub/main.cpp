/* The Arduino core's main() in miniature: setup() once, loop() TT_LOOPS times. */
#include "Arduino.h"

HardwareSerialStub Serial;

int main()
{
    setup();
    for (long i = 0; i < TT_LOOPS; i++) {
        loop();
    }
    Serial.flush();
    return 0;
}
