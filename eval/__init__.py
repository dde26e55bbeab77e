"""kernelrl.eval."""
