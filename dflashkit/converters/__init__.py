"""dflashkit.converters"""
