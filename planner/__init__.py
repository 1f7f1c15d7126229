"""Planner: Algorithm 1 (replica sizing, top-rate admission, LPT placement) as pure numpy code.

Empty until the planner-core issue lands; the folder exists now so the package layout and namespace
mapping are fixed from the first commit.
"""
