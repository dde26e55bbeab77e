"""kernelrl.launch."""
