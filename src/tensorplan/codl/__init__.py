"""codl"""
