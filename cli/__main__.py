from tallow.cli.entry import main

main()
