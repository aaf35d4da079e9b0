/* The few Arduino declarations tinytrain's sketch and Arduino port use, for compiling and running
 * them on the host (tests/test_library.py): Serial writes to stdout and reads stdin (the bytes
 * a host sent, then -1 for "nothing waiting" once they are used up), delay() returns at once.
 * Not the Arduino API; only its shape. */
#ifndef TT_ARDUINO_STUB_H
#define TT_ARDUINO_STUB_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

class HardwareSerialStub {
public:
    void begin(unsigned long baud) { (void)baud; }
    size_t write(uint8_t c) { return fwrite(&c, 1, 1, stdout); }
    int read()
    {
        int c = getchar();
        return c == EOF ? -1 : c;
    }
    void flush() { fflush(stdout); }
    explicit operator bool() const { return true; }
};

extern HardwareSerialStub Serial;

inline void delay(unsigned long ms) { (void)ms; }

void setup();
void loop();

#endif
