from netplugin.frontends.cli.fast import main

main()
