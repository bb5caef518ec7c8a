"""dflashkit.io"""
