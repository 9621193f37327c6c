"""The inference workers: the LitServe loop, the LitAPIs and the scheduler they drive."""
