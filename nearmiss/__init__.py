"""nearmiss: repair near-miss JAX/Pallas kernels by debugging them."""
