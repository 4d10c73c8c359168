"""``make demo`` / ``fraudctl demo``: one night of the production pipeline on embedded defaults."""
