"""`python -m navdoctor ...`: the same command as the `navdoctor` console script, for an
interpreter whose scripts folder is not on PATH (a venv not activated, `pip install --target`)."""
from navdoctor.cli import console

if __name__ == "__main__":
    console()
