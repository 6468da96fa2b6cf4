from netplugin.cli import main

main()
