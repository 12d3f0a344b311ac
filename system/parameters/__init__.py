"""The versioned parameter service: store, server, publisher and subscriber clients."""
