"""`python -m flashd.daemon ARGS` is `flashd serve ARGS` (handy where the console script is not on PATH)."""
from .serve_command import serve_command

if __name__ == "__main__":
    serve_command(prog_name="python -m flashd.daemon")
