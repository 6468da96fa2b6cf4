from netplugin.frontends.cli.entry import main

main()
