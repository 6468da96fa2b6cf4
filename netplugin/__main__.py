from netplugin.frontends.thin import main

main()
