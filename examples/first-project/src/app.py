"""The app's entry point."""

import config


def main():
    print(f"retrying up to {config.MAX_RETRIES} times")


if __name__ == "__main__":
    main()
