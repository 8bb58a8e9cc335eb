// Preloaded into Portkey's gateway by loadtests/peers (node --require): its server listens on
// every interface (server.listen(port) with no host); the benchmark sends traffic only to
// 127.0.0.1, so the listener is bound there too. Nothing else is changed.
"use strict";
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number") {
    if (args.length === 1 || typeof args[1] === "function") {
      args.splice(1, 0, "127.0.0.1");
    } else if (args[1] === undefined || args[1] === null) {
      args[1] = "127.0.0.1";
    }
  }
  return listen.apply(this, args);
};
