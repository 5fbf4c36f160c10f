// Serves @firestore-emulator/server on 127.0.0.1:<port> for the Python tests.
// (Its start() binds every interface; the tests talk to loopback only, so bind that.)
const grpc = require('@grpc/grpc-js');
const { FirestoreServer } = require('@firestore-emulator/server');

const port = parseInt(process.argv[2], 10);
const emulator = new FirestoreServer();
emulator.server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (error) => {
  if (error) {
    console.error(error);
    process.exit(1);
  }
  console.log(`firestore emulator listening on 127.0.0.1:${port}`);
});
process.on('SIGTERM', () => process.exit(0));
