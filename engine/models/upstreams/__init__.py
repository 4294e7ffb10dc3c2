"""upstreams"""
