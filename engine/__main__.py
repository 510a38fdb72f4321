import sys

from dataloader_tuner.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
