/* Standalone driver for a generated model, built with -fsanitize=address,undefined by
 * tests/test_codegen_asan.py: reads samples (int8 x[input_len], int32 label) from stdin and
 * prints the state hash after every training step, then the prediction of each sample. */
#include <stdio.h>
#include <stdint.h>
#include "tt_model.h"

int main(void)
{
    int8_t x[TT_MODEL_INPUT_LEN];
    int32_t label, loss;
    int8_t xs[64][TT_MODEL_INPUT_LEN];
    int n = 0, i;
    printf("%08x\n", (unsigned)tt_model_state_hash());
    while (fread(x, 1, sizeof x, stdin) == sizeof x && fread(&label, 4, 1, stdin) == 1) {
        int32_t pred = tt_model_train_step(x, label, &loss);
        printf("%08x %d %d\n", (unsigned)tt_model_state_hash(), (int)loss, (int)pred);
        if (n < 64) {
            for (i = 0; i < TT_MODEL_INPUT_LEN; i++) xs[n][i] = x[i];
            n++;
        }
    }
    for (i = 0; i < n; i++) printf("p %d\n", (int)tt_model_predict(xs[i]));
    return 0;
}
