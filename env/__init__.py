"""kernelrl.env."""
