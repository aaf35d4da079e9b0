"""ServerApp: IntegerFedAvg (tinytrain.federated.flower) over Flower's round loop, every
update verified (CRC-32, schema, state hash), settings from the run_config."""
from flwr.serverapp import ServerApp

from tinytrain.federated.flower import server_main

app = ServerApp()


@app.main()
def main(grid, context) -> None:
    server_main(grid, context)
