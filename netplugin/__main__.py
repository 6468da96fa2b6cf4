from netplugin.frontends.cli import main

main()
