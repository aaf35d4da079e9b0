/** A tiny stand-in model for protocol tests: a byte array of "parameters" that training adds
 *  the input into. Not a neural network; just enough state to see every command's effect.
 *  It carries the on-device update codec (tt_fedcodec.h) over its parameters read as a store of
 *  300 int16 (bytes 0..599) and 100 int32 (bytes 600..999). */
#ifndef TT_FAKE_MODEL_H
#define TT_FAKE_MODEL_H

#include "tt_device.h"

#define TT_FAKE_PARAMS 1000u
#define TT_FAKE_INPUT 16u
#define TT_FAKE_CLASSES 10u
#define TT_FAKE_SCHEMA 0x5EED5EEDu

/** The model description handed to tt_device_run / tt_proto_init. */
extern const tt_device_model tt_fake_model;

/** Power-on state: params[i] = 7 i + 1, step 0, seed 1, nothing staged. */
void tt_fake_power_on(void);

#endif /* TT_FAKE_MODEL_H */
