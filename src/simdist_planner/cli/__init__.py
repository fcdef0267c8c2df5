"""Console commands: thin main()s over the layers below (see setup.py for their names)."""
