"""The front process of a multi-model server: the model registry, the runner pool and the proxy to runners."""
