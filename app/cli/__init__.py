"""The `cacheroute` command: one subcommand group per area, and the only place objects are wired."""
