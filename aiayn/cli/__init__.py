"""The ``aiayn`` command line: one entry point, one subcommand per job."""
