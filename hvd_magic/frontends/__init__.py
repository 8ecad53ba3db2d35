"""The ways into hvd_magic besides the API: the magics, script runs, the terminal command."""
