"""The engine: requests, step plans, the engine loop, replicas and routers, the paged KV cache, schedulers, metrics, and the Simulation that assembles them."""
