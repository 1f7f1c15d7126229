"""The live demo: synthetic gateways -> streams agent -> planner -> dispatchers, with a live view."""
