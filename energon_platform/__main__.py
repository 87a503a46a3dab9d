from energon_platform.cli import run

run()
