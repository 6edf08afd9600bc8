"""The command line's commands, one module each, named after the command (`fastloader bench` is
bench.py). Each provides HELP, EXAMPLES, add_arguments(parser) and run(args), and imports only the
standard library at its top, so that building the parser stays quick."""
