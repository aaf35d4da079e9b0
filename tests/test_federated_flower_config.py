"""The Flower App's run_config (flower.settings) and `tinytrain federate-gateway` bad input:
one line naming the key or option and the fix; exit 2 on the command line."""
import pytest

pytest.importorskip("flwr", reason="flwr not installed (pip install tinytrain[flower])")


def test_defaults_match_the_app_pyproject():
    import tomllib

    from tinytrain.federated.flower import RUN_CONFIG, settings
    from tests.flowerutil import APP

    cfg = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert cfg == {k: d for k, (_, d) in RUN_CONFIG.items()}
    s = settings(cfg)["config"]
    assert (s.rounds, s.compress, s.compress_down, s.local_steps, s.quorum) == (3, "int8", "none", None, 0.5)


@pytest.mark.parametrize("rc,msg", [
    ({"nope": 1}, "unknown key(s) ['nope']"),
    ({"compress": "int9"}, "compress='int9': use one of none, int8, int4, sign"),
    ({"num-server-rounds": "3"}, "num-server-rounds='3': must be int"),
    ({"num-server-rounds": 0}, "num-server-rounds=0: must be >= 1"),
    ({"local-steps": -1}, "local-steps=-1: must be >= 0"),
    ({"partition": "dirichlet:x"}, "ALPHA must be a positive number"),
    ({"fraction-train": 1.5}, "fraction-train must be in (0, 1]"),
    ({"quorum": True}, "quorum=True: must be float"),
    ({"server-momentum": 1.0}, "server-momentum 1.0: must be in [0, 0.99]"),
    ({"server-lr": 0.0}, "server-lr 0.0: must be in (0, 4]"),
    ({"prox-mu": -0.1}, "prox-mu -0.1: must be a finite number >= 0"),
    ({"prox-every": 0}, "prox-every 0: must be an integer >= 1"),
    ({"residual-bits": 8}, "residual-bits 8: use one of 64, 32, 16"),
    ({"devices-per-node": 0}, "devices-per-node=0: must be >= 1"),
])
def test_bad_run_config(rc, msg):
    from tinytrain.federated.flower import settings

    with pytest.raises(ValueError) as e:
        settings(rc)
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv,msg", [
    (["--board", "mps2_an386", "--listen", "7801"], "--listen '7801': give HOST:PORT"),
    (["--board", "nucleo_f446re"], "nucleo_f446re is a real board"),
    (["--board", "nope"], "nope"),
])
def test_gateway_bad_input(argv, msg, capsys):
    from tinytrain.cli import main

    rc = main(["federate-gateway", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and msg in err[0], err


def test_gateway_port_in_use(capsys):
    import socket

    from tinytrain.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc = main(["federate-gateway", "--board", "mps2_an386", "--listen", f"127.0.0.1:{s.getsockname()[1]}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "choose a free port" in err[0], err
