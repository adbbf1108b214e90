from postrelay.cli import app

app()
