"""ClientApp: the devices this node serves (its partition-id in simulation; node_config
devices="0,1" and optionally gateway="HOST:PORT" in deployment) train one round each."""
from flwr.clientapp import ClientApp

from tinytrain.federated.flower import client_train

app = ClientApp()


@app.train()
def train(msg, context):
    return client_train(msg, context)
