"""What every layer that owns a `quantstudy` subcommand declares it with: the `Command` entry
of the CLI's registry and the argparse types its options share (`command.py`).

Below every stage that owns a command (the study, search, sweep, bench, bridge, package and
zoo) and above nothing: it imports only argparse, so building the parser imports no torch.
"""
