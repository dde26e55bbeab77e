"""kernelrl.rewards."""
