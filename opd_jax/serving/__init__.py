"""A served teacher: the logprob API subset (protocol), its HTTP client and our JAX server."""
