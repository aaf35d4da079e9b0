"""tinytrain's Flower App: the apps are thin; the logic is tinytrain.federated.flower."""
