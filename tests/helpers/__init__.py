"""What the tests share that is not a fixture: the synthetic models, stand-in servers, a terminal on a pty, the independent references, and ways to run tallow."""
