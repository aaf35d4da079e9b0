"""Behaviour is pinned: the built-in workloads, trained as the README's commands train them,
end at these state hashes (parameters, optimizer state, PRNG, counters after the last step).
A refactor of the ops, the simulator or the code generator must leave them unchanged; a change
that means to alter the arithmetic updates them here, in its own commit, saying why.

    tinytrain train --data digits --model digits-mlp --epochs 20 --seed 0        -> f68475aa
    tinytrain train --data digits-image --model digits-cnn --epochs 2 --seed 0   -> 01257079
    tinytrain train --data mnist1d --model mnist1d-cnn --epochs 2 --seed 0       -> 4d3bf243
"""
import pytest

import tinytrain as tt

GOLDEN = [("digits", "digits-mlp", 20, 0xF68475AA), ("digits-image", "digits-cnn", 2, 0x01257079),
          ("mnist1d", "mnist1d-cnn", 2, 0x4D3BF243)]


@pytest.mark.parametrize("data,model,epochs,state_hash", GOLDEN)
def test_workload_state_hash_is_unchanged(data, model, epochs, state_hash):
    ds = tt.load_dataset(data)
    m = tt.build_model(model, ds, seed=0)
    tt.fit(m, ds, epochs=epochs, seed=0, progress=False)
    assert m.state_hash() == state_hash, f"{model}: 0x{m.state_hash():08x}"
