"""kernelrl.rl."""
