"""dflashkit.runtime"""
