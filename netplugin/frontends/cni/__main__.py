from netplugin.frontends.cni.router import main

main()
