"""rewrite"""
