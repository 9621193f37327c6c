"""The inference engine: device probing and sessions, one decoder class per graph layout, the cache, Engine."""
