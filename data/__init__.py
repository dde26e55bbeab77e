"""kernelrl.data."""
