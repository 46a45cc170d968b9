"""What a composed config must satisfy before anything loads: the rule of every setting (`known_settings.py`), the
start-up check that applies them and each component's own rules (`check.py`), and what a plain command line adds for
its machine (`command_line.py`)."""
