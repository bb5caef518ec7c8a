"""dflashkit.kernels"""
