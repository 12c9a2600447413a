from dsv4bench.cli.main import main

if __name__ == "__main__":
    main()
