"""Dispatcher: the in-gateway library that follows the plan topic and routes each request.

Empty until the dispatcher issue lands; the folder exists now so the package layout and namespace
mapping are fixed from the first commit.
"""
